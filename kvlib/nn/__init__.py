"""The torch zone: mechanisms of the course run as real tensor code, each checked
against a torch reference in ``tests/``. Nothing is imported here, so
``import kvlib.nn`` stays cheap until a submodule is used.
"""
