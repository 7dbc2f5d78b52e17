"""The retry-flood guard's runtime part (docs/flood-guard.md): a feature behind the seams the shared path asks
(docs/architecture.md, "Where a new feature goes"). Its rules are pure: retrytopics/core/flood_guard.py.

- `breaker.py`: `HandlerGuard`, one guarded handler's breaker in a process, shared by its consumers' threads;
- `stage.py`: `FloodGuardedStage`, the admission step: a call goes through only when the guard admits it;
- `holds.py`: `FloodHold`, the hold reason: a guarded handler's partitions are held while its guard refuses.
"""
