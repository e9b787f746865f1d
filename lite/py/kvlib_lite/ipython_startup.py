"""Executed by IPython in the notebook's namespace when the browser's kernel starts."""

import kvlib_lite.startup

kvlib_lite.startup.install(get_ipython())  # type: ignore[name-defined]  # noqa: F821
del kvlib_lite
