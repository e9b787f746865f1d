"""Chapter 7: a KV-bound deployment, from scenario to remedy and bill.

- :mod:`kvlib.capacity.scenario`: what a deployment states, and the checks that
  refuse one no engine would run;
- :mod:`kvlib.capacity.assessment`: the pool, seats and decode bound a scenario allows;
- :mod:`kvlib.capacity.remedies`: each remedy applied to a scenario, ranked;
- :mod:`kvlib.capacity.crossover`: dedicated GPUs against per-token pricing;
- :mod:`kvlib.capacity.symptoms`: recognising a KV-bound engine from its metrics;
- :mod:`kvlib.capacity.examples`: the chapter's bundled scenarios, one KV-bound and one
  compute-bound.

Standard library only.
"""
