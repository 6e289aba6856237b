"""Stop strings matched in streamed text. A chat processor's text never reaches the frontend's
detokenizer, where built-in requests have their stop strings matched, and workers may ignore
them, so the built-in `vllm` and `sglang` processors match them here."""


class StopStrings:
    """Finds stop strings in streamed text, holding back what could be the start of one."""

    def __init__(self, stops, include: bool):
        self.stops = [s for s in stops if s]
        self.include = include
        self.held = ""

    def feed(self, text: str):
        """(text to emit now, whether a stop string matched)."""
        self.held += text
        if not self.stops:
            out, self.held = self.held, ""
            return out, False
        hits = [(self.held.find(s), s) for s in self.stops if s in self.held]
        if hits:
            at, stop = min(hits)
            out = self.held[:at + (len(stop) if self.include else 0)]
            self.held = ""
            return out, True
        # Hold back the longest tail that starts some stop string.
        keep = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.held)), keep, -1):
                if self.held.endswith(stop[:size]):
                    keep = size
                    break
        cut = len(self.held) - keep
        out, self.held = self.held[:cut], self.held[cut:]
        return out, False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
