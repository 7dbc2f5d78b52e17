"""Handler concurrency's runtime part (docs/concurrency.md): a feature behind the seams the shared path asks
(docs/architecture.md, "Where a new feature goes"). Its configuration is retrytopics/core/concurrency.py.

- `window.py`: `Window`, one handler's in-flight window: which admitted record starts now, which waits for
  its gate (pure bookkeeping);
- `workers.py`: `Workers`, where the calls run (an event loop for `async def` handlers, a thread pool for
  plain ones), their outcomes handed back as values;
- `stage.py`: `CallWindow` and the admission steps `WindowedSourceStage` / `WindowedTierStage`;
- `holds.py`: `WindowFull`, the hold reason: a handler's partitions are held while its window is full.
"""
