"""Serving-side arithmetic and simulation: queues, rate limits, schedulers.

numpy is allowed here (never torch); ``redis`` is imported only inside
:mod:`kvlib.serving.ratelimit`, where a limiter needs a server.
"""
