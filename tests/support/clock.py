"""A wall clock tests can move by hand (through connect(now=...))."""


class FakeClock:
    def __init__(self, ms: int = 1_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms
