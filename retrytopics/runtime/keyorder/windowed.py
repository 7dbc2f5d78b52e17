"""Key order with handler concurrency (docs/concurrency.md, "Key order through the tiers"): key order's
decisions taken at the moment a windowed record would start, through the window's seam
(runtime/concurrency/stage.py, `StartCheck`), not when it enters the window.

Within one partition the window's key gate starts a key's records one at a time in offset order; a returned
call's outcome is acted on (the hand-off tells key order of a failure's hop) before the next record of its key
is asked. So a record whose key has a chain in a tier, even one its predecessor opened a moment ago in this
window, follows it unhandled, and one whose key's last hop is not acknowledged yet waits in the window holding
its key's gate (every later record of its key stays behind it) while other keys run.

- `KeyOrderStarts` (a main consumer, `KeyOrder`): handle, follow (`Follow`, or a `Duplicate` read again), or
  not yet (its key's hop unacknowledged; `max_blocked_keys` reached, its partition then held; its key state
  not read);
- `TierOrderStarts` (a tier consumer, `TierOrder`): a retried record waits while a hop of its chain is in flight;
- `WindowedOrderedTierStage`: a tier consumer's stage with both: retried records admitted by key order, then
  run in the window; a follower is decided as ever once no record of its key is in the window (what it waits
  behind may be there, its fate not known yet): until then it waits in memory at its partition's head. One
  handled is called on the consumer's thread.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator, Mapping

from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.keyorder.follower import Follower
from retrytopics.core.keyorder.source_chains import Admit
from retrytopics.core.keyorder.tier_passages import Step
from retrytopics.core.ports import Message
from retrytopics.observe.events import Emitter
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.concurrency.stage import CallWindow, WindowedTierStage
from retrytopics.runtime.keyorder.ordering import KeyOrder, TierOrder
from retrytopics.runtime.keyorder.stage import FOLLOWER, OrderedTierStage, followed
from retrytopics.runtime.records.calls import Binding, Invoker
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import Outcome, Parked, Waiting
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.records.tier import TierStage
from retrytopics.runtime.waiting import PauseController

__all__ = ["KeyOrderStarts", "TierOrderStarts", "WindowedOrderedTierStage"]

#: how soon a follower waiting in memory for a record of its key in the window is decided again (one poll)
_WINDOW_RECHECK_MS = 1


class KeyOrderStarts:
    """A main consumer's key order, asked as a windowed source record would start (a `StartCheck`)."""

    def __init__(self, key_order: KeyOrder, now_ms: Callable[[], int]) -> None:
        self._key_order = key_order
        self._now_ms = now_ms

    def before_start(self, binding: Binding, msg: Message, state: RetryHeaders | None) -> Outcome | None:
        if binding.ordering is None or msg.key is None:
            return None
        # nothing is parked in key order here: the window's gate keeps the key's later records behind this one
        admission = self._key_order.admit(msg, unparked=True)
        if admission.action is Admit.HANDLE:
            return None
        if admission.action is Admit.FOLLOW:
            return followed(binding, msg, admission, now_ms=self._now_ms())
        return Parked(msg)  # not yet: asked again at the next poll (a PAUSE holds its partition meanwhile)


class TierOrderStarts:
    """A tier consumer's key order, asked as a windowed retried record would start (a `StartCheck`)."""

    def __init__(self, tier_order: TierOrder) -> None:
        self._tier_order = tier_order

    def before_start(self, binding: Binding, msg: Message, state: RetryHeaders | None) -> Outcome | None:
        if binding.ordering is None or msg.key is None or state is None or msg.topic == binding.topic:
            return None
        if self._tier_order.on_retry(msg, state).step is Step.WAIT:
            return Parked(msg)
        return None


class WindowedOrderedTierStage(OrderedTierStage, WindowedTierStage):
    """A tier consumer's records stage with key order and handler concurrency (see the module docstring): key
    order's admission (`OrderedTierStage`) hands the records it lets through to the window
    (`WindowedTierStage`), which asks `TierOrderStarts` again as each starts."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        waiting: PauseController,
        audit: DuplicateAudit,
        invoker: Invoker,
        ownership: OwnershipGuard,
        duplicates: DuplicateCheck,
        *,
        clock: Clock,
        rng: random.Random,
        stop: threading.Event,
        emitter: Emitter,
        consumer: str,
        tier_order: TierOrder,
    ) -> None:
        # both parents add one attribute to the tier stage: set here rather than through two constructors
        TierStage.__init__(
            self, bindings, waiting, audit, invoker, ownership, duplicates, clock=clock, rng=rng, stop=stop
        )
        self._tier_order = tier_order
        self.window = CallWindow(
            bindings,
            failed=self.failed,
            emitter=emitter,
            consumer=consumer,
            stop=stop,
            monotonic=clock.monotonic,
            starts=TierOrderStarts(tier_order),
        )

    def _follower(self, binding: Binding, msg: Message, follower: Follower) -> Iterator[Outcome]:
        if self.window.busy(msg):
            yield Waiting(msg, self._now_ms() + _WINDOW_RECHECK_MS, FOLLOWER)
            return
        yield from super()._follower(binding, msg, follower)
