"""Token ids → text as it may be shown while decoding: never a broken UTF-8 character, never text past a stop string.

A streaming client (`nextn run`, the server's SSE routes) feeds each emitted token's bytes and prints what `push`
returns. Two things are held back, as llama.cpp's server does (tools/server/server-context.cpp `process_token`):
- the bytes of a UTF-8 character split across tokens, until the character is whole (an incremental decoder);
- the tail of the text that is a prefix of a stop string (`string_find_partial_stop`), until it either completes
  the stop string (then the text ends before it) or stops matching (then it is released).
`finish()` releases what is still held when decoding ends by another rule (EOS, the -n budget), so the streamed
pieces always concatenate to the final text. Stop strings are matched in characters of the decoded text, the same
text `Model.generate` cuts; the engine's finish rules (`speculative.FinishRules`) match their UTF-8 bytes.
"""
from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, token_bytes, stop=()):
        self.token_bytes = token_bytes
        self.stop = [s for s in stop if s]
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""          # all decoded text so far (cut at the stop string once one is found)
        self.sent = 0           # characters of `text` already returned
        self.stopped_by = None  # the stop string that ended the text, if any

    def push(self, token: int) -> str | None:
        """Feed one token; returns the text that may be shown now ("" while a stop string may be starting), or None
        while the token ends inside a UTF-8 character (nothing is decodable yet)."""
        if self.stopped_by is not None:
            return ""
        raw = self.token_bytes(token)
        piece = self._utf8.decode(raw)
        if raw and not piece and self._utf8.getstate()[0]:
            return None
        self.text += piece
        hit = self._first_stop()
        if hit is not None:
            at, word = hit
            self.text, self.stopped_by = self.text[:at], word
            return self._release(len(self.text))
        return self._release(len(self.text) - self._partial_stop())

    def finish(self) -> str:
        """Everything still held (a trailing incomplete character decodes as U+FFFD)."""
        if self.stopped_by is None:
            self.text += self._utf8.decode(b"", final=True)
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out, self.sent = self.text[self.sent:upto], upto
        return out

    def _first_stop(self):
        best = None
        for w in self.stop:
            i = self.text.find(w, max(0, self.sent - len(w)))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, w)
        return best

    def _partial_stop(self) -> int:
        """Length of the longest tail of the unsent text that is a proper prefix of a stop string."""
        tail = self.text[self.sent:]
        n = 0
        for w in self.stop:
            for k in range(min(len(w) - 1, len(tail)), n, -1):
                if tail.endswith(w[:k]):
                    n = k
                    break
        return n
