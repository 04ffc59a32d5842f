"""Capped, jittered exponential back-off between connection attempts."""

from __future__ import annotations

import random

from holdfast.sdk.options import ReconnectOptions


class Backoff:
    """Delays for consecutive failed rounds of connection attempts."""

    def __init__(self, options: ReconnectOptions, rng: random.Random | None = None) -> None:
        self._options = options
        self._rng = rng or random.Random()
        self._failures = 0

    def next_delay(self) -> float:
        """The delay before the next round; each call grows it up to the cap."""
        opts = self._options
        base = opts.initial * opts.multiplier**self._failures
        if base < opts.maximum:
            self._failures += 1
        else:
            # At the cap the exponent stops growing: multiplier**n is a float that
            # overflows (OverflowError) after about 1024 failed rounds, 3.5 minutes of
            # a broker down at the default 0.2 s cap, which failed the session.
            base = opts.maximum
        return base * self._rng.uniform(1 - opts.jitter, 1 + opts.jitter)

    def reset(self) -> None:
        """A connection succeeded: start again from the initial delay."""
        self._failures = 0
