"""Trio actors, each a thin loop over a pure policy: runtime owner, admission, composer, preemption."""
