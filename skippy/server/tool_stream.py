"""Tool calls parsed out of generated text as it streams: one pass over the characters, nothing re-parsed.

`CallParser.feed(text)` takes the next piece of a choice's output and returns what can be said of it
already: `Content(text)`, `CallStart(index, id, name)` and `ArgsDelta(index, text)`; `finish()` flushes
what was held back. The streamed route sends these as OpenAI deltas; the non-streamed one feeds the
whole text through the same parser (`parse`), so a call's streamed argument fragments concatenate to
exactly the non-streamed `arguments` (the model's own JSON text, not a re-serialisation).

What counts as a call (tools.FORMATS, any of them, whatever the template's):
- `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` anywhere in the text (Hermes);
- an answer that *starts* (after whitespace, `[TOOL_CALLS]` or `<|python_tag|>`) with such an object
  (`parameters` for `arguments`: Llama 3) or a JSON array of them (Mistral).
A call's text is held back from the moment it may be one; it is committed (its `CallStart` sent) once
its name is a known function and its arguments have begun (`{`), after which the argument text goes out
as it comes. Anything else (an unknown name or key, not JSON) is released as content, as if never held.
Whitespace next to a call is held: it goes out only between content (the content of an answer with calls
is stripped as a whole, as before); an answer without calls comes out unchanged.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Iterable, Sequence

import attrs

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MARKERS = ("[TOOL_CALLS]", "<|python_tag|>")
_WS = " \t\r\n"
_ARGS_KEYS = ("arguments", "parameters")
_SKIPPED_KEYS = ("type", "id")  # string fields some templates add around a call
_STRUCT = re.compile(r'[{}\[\]"\\]')  # what changes the depth of an arguments value
_STR_END = re.compile(r'["\\]')


@attrs.frozen
class Content:
    text: str


@attrs.frozen
class CallStart:
    index: int
    id: str
    name: str


@attrs.frozen
class ArgsDelta:
    index: int
    text: str


Event = Content | CallStart | ArgsDelta


class _Failed(Exception):
    """The held text is not a call after all (`at`: the index of the character that says so)."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _Object:
    """One call object `{"name": ..., "arguments": {...}}`, scanned a run of characters at a time.

    `scan` raises _Failed while nothing is committed; once committed, a malformed rest ends the call
    (`state` done) and scan returns where that rest begins."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self.state = "open"  # open, key_or_end, key, colon, value, string, args, skip, scalar, comma_or_end, done
        self.key: str | None = None
        self.buf: list[str] = []  # a string being read (key, name, string-form arguments)
        self.escaped = False
        self.name: str | None = None
        self.args: list[str] = []  # argument text not sent yet (before the commit)
        self.args_state = "none"  # none, open (the object's text going by), done
        self.depth = 0
        self.in_str = False
        self.committed = False
        self.after_comma = False
        self.at = 0  # the character being looked at (where a failure is reported)
        self.out: list[str] = []

    def scan(self, s: str, i: int, out: list[str]) -> int:
        """Consume s[i:] (or up to the object's end); argument text once committed goes to `out`."""
        self.out = out
        try:
            return self._scan(s, i)
        except _Failed as f:
            if not self.committed:
                raise
            self.state = "done"
            return f.at

    def _scan(self, s: str, i: int) -> int:
        n = len(s)
        while i < n and self.state != "done":
            st = self.state
            if st in ("args", "skip"):
                i = self._args(s, i)
                continue
            if st in ("key", "string"):
                i = self._string(s, i)
                continue
            c = s[i]
            if st == "scalar":  # an extra key's number, true, false or null (after the commit)
                if c in ",}":
                    self.state = "comma_or_end"
                else:
                    i += 1
                continue
            self.at = i
            i += 1
            if c in _WS:
                continue
            if st == "open":
                self._expect(c == "{")
                self.state = "key_or_end"
            elif st == "key_or_end":
                if c == "}" and not self.after_comma:
                    self._end()
                else:
                    self._expect(c == '"')
                    self.state, self.buf = "key", []
            elif st == "colon":
                self._expect(c == ":")
                self.state = "value"
            elif st == "value":
                self._value(c)
            elif c == ",":  # comma_or_end
                self.state, self.after_comma = "key_or_end", True
            else:
                self._expect(c == "}")
                self._end()
        return i

    def _expect(self, ok: bool) -> None:
        if not ok:
            raise _Failed(self.at)

    def _string(self, s: str, i: int) -> int:
        """A JSON string's body up to its closing quote (escapes kept raw, decoded at the end)."""
        n = len(s)
        while i < n:
            if self.escaped:
                self.buf.append(s[i])
                self.escaped = False
                i += 1
                continue
            m = _STR_END.search(s, i)
            if m is None:
                self.buf.append(s[i:])
                return n
            j = m.start()
            self.buf.append(s[i:j])
            if s[j] == "\\":
                self.buf.append("\\")
                self.escaped = True
                i = j + 1
                continue
            self.at = j
            try:
                value = json.loads('"' + "".join(self.buf) + '"')
            except ValueError:
                raise _Failed(j) from None
            self._string_done(value)
            return j + 1
        return i

    def _string_done(self, value: str) -> None:
        if self.state == "key":
            self.key, self.state = value, "colon"
            return
        self.state = "comma_or_end"
        self.after_comma = False
        if self.key == "name":
            self._expect(self.name is None and value in self.names)
            self.name = value
        elif self.key in _ARGS_KEYS:  # arguments as a JSON string (some templates): an object inside
            try:
                ok = isinstance(json.loads(value), dict)
            except ValueError:
                ok = False
            self._expect(ok)
            self.args, self.args_state = [value], "done"
        self._maybe_commit()

    def _value(self, c: str) -> None:
        key = self.key
        if key == "name" or key in _SKIPPED_KEYS:
            self._expect(c == '"')
            self.state, self.buf = "string", []
        elif key in _ARGS_KEYS and self.args_state == "none":
            if c == '"':
                self.state, self.buf = "string", []
                return
            self._expect(c == "{")
            self.args, self.args_state, self.depth, self.in_str = ["{"], "open", 1, False
            self.state = "args"
            self._maybe_commit()
        elif self.committed and key not in ("name", *_ARGS_KEYS):  # an extra field of a call: skipped
            if c == '"':
                self.state, self.buf = "string", []
            elif c in "{[":
                self.state, self.depth, self.in_str = "skip", 1, False
            else:
                self.state = "scalar"
        else:
            raise _Failed(self.at)  # an unknown key before the commit, or a repeated one: not a call

    def _args(self, s: str, i: int) -> int:
        """The arguments object's raw text, up to the brace that closes it (or an extra field's value,
        skipped: state `skip`)."""
        n, start, skipping = len(s), i, self.state == "skip"
        while i < n:
            if self.escaped:
                self.escaped = False
                i += 1
                continue
            m = (_STR_END if self.in_str else _STRUCT).search(s, i)
            if m is None:
                i = n
                break
            c, i = s[m.start()], m.end()
            if c == "\\":
                self.escaped = self.in_str
            elif c == '"':
                self.in_str = not self.in_str
            elif c in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    self.state, self.after_comma = "comma_or_end", False
                    if not skipping:
                        self.args_state = "done"
                    break
        if not skipping:
            self.args.append(s[start:i])
            self._maybe_commit()
        return i

    def _maybe_commit(self) -> None:
        if self.name is not None and self.args_state != "none":
            self.committed = True
            self.out.extend(self.args)
            self.args = []

    def _end(self) -> None:
        self._expect(self.name is not None)
        if self.args_state == "none":  # no arguments given: an empty object, as OpenAI sends it
            self.args, self.args_state = ["{}"], "done"
        self.state = "done"
        self._maybe_commit()


class CallParser:
    """One choice's output, fed piece by piece (see the module docstring)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.calls = 0
        self._mode = "start"  # start, content, tag (inside <tool_call>), close (after its object), json
        self._pending = ""  # text that may still begin a tag or marker
        self._ws = ""  # trailing whitespace of the content, held until more content follows
        self._emitted = False  # any content sent yet
        self._held: list[str] = []  # raw text of a call not committed yet
        self._obj: _Object | None = None
        self._list: str | None = None  # json mode: None (one object), "item", "sep"
        self._index = -1

    # -- public ---------------------------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if text:
            self._run(self._pending + text, out)
        return _merged(out)

    def finish(self) -> list[Event]:
        """The end of the output: held text that never became a call is content after all."""
        out: list[Event] = []
        rest, self._pending = self._pending, ""
        if self._mode in ("tag", "json") and not self._committed():
            self._release(out)
        elif self._mode in ("start", "content"):
            self._content(rest, out)
        self._mode = "content"
        if self._ws and not self.calls:  # an answer without calls comes out whole
            out.append(Content(self._ws))
        self._ws = ""
        return _merged(out)

    # -- the modes --------------------------------------------------------------------------------

    def _run(self, s: str, out: list[Event]) -> None:
        self._pending = ""
        i = 0
        while i < len(s):
            mode = self._mode
            if mode == "start":
                i = self._start(s, i, out)
            elif mode == "content":
                i = self._scan_content(s, i, out)
            elif mode == "close":
                i = self._close(s, i, out)
            else:
                i = self._call_text(s, i, out)

    def _start(self, s: str, i: int, out: list[Event]) -> int:
        """The answer's beginning: a marker or a JSON value makes it a call; anything else is content."""
        head = s[i:].lstrip(_WS)
        if not head:
            self._pending = s[i:]
            return len(s)
        for marker in MARKERS:
            if head.startswith(marker):
                self._held = [s[i:len(s) - len(head) + len(marker)]]
                return self._enter_json(s, len(s) - len(head) + len(marker))
        if any(m.startswith(head) for m in (*MARKERS, OPEN)):
            self._pending = s[i:]
            return len(s)
        if head[0] in "{[":
            self._held = [s[i:len(s) - len(head)]]
            return self._enter_json(s, len(s) - len(head))
        self._mode = "content"
        return i

    def _enter_json(self, s: str, i: int) -> int:
        while i < len(s) and s[i] in _WS:
            self._held.append(s[i])
            i += 1
        if i == len(s):
            self._mode, self._list = "json", "open"  # the value's first character decides
            return i
        self._mode = "json"
        if s[i] == "[":
            self._held.append("[")
            self._list = "item"
            return i + 1
        self._list = None
        self._obj = _Object(self.names)
        return i

    def _scan_content(self, s: str, i: int, out: list[Event]) -> int:
        j = s.find(OPEN, i)
        if j >= 0:
            self._content(s[i:j], out)
            self._mode, self._held, self._obj = "tag", [OPEN], _Object(self.names)
            return j + len(OPEN)
        keep = _partial_suffix(s, i, OPEN)
        self._content(s[i:len(s) - keep], out)
        self._pending = s[len(s) - keep:]
        return len(s)

    def _close(self, s: str, i: int, out: list[Event]) -> int:
        """After a Hermes call's object: whitespace and its closing tag."""
        while i < len(s) and s[i] in _WS:
            i += 1
        rest = s[i:]
        if rest.startswith(CLOSE):
            self._mode = "content"
            return i + len(CLOSE)
        if CLOSE.startswith(rest):
            self._pending = rest
            return len(s)
        self._mode = "content"  # no closing tag: the rest is content
        return i

    def _call_text(self, s: str, i: int, out: list[Event]) -> int:
        """A call object's characters (in a tag, or a JSON answer), its arguments sent once committed."""
        start = i
        try:
            if self._obj is None:
                i = self._list_step(s, i)
                if self._obj is None:
                    if self._mode == "json":
                        self._hold(s[start:i])
                    return i
                self._hold(s[start:i])
                start = i
            obj = self._obj
            was = obj.committed
            args: list[str] = []
            i = obj.scan(s, i, args)
        except _Failed as f:
            self._hold(s[start:f.at + 1])
            return self._failed(f.at + 1, out)
        if obj.committed and not was:
            self._index += 1
            self.calls += 1
            self._held = []
            out.append(CallStart(self._index, new_call_id(), obj.name or ""))
        if obj.committed:
            if args:
                out.append(ArgsDelta(self._index, "".join(args)))
        else:
            self._hold(s[start:i])
        if obj.state == "done":
            self._obj, self._held = None, []
            if self._mode == "tag":
                self._mode = "close"
            elif self._list is None:
                self._after_json()
            else:
                self._list = "sep"
        return i

    def _list_step(self, s: str, i: int) -> int:
        """Between the items of a JSON array of calls (or before a JSON answer's first character)."""
        while i < len(s):
            c = s[i]
            if c in _WS:
                i += 1
                continue
            if self._list == "open":
                if c == "[":
                    self._list = "item"
                    i += 1
                    continue
                self._list, self._obj = None, _Object(self.names)
                return i
            if self._list == "item":
                if c != "{":
                    raise _Failed(i)
                self._obj = _Object(self.names)
                return i
            if c == ",":
                self._list = "item"
                i += 1
                continue
            if c == "]" and self.calls:
                self._after_json()
                return i + 1
            raise _Failed(i)
        return i

    def _after_json(self) -> None:
        self._mode, self._list, self._held = "content", None, []

    def _failed(self, i: int, out: list[Event]) -> int:
        """Not a call: the held text goes out as content, and parsing goes on after it."""
        self._release(out)
        self._obj, self._list, self._mode = None, None, "content"
        return i

    def _release(self, out: list[Event]) -> None:
        held, self._held = "".join(self._held), []
        self._content(held, out)

    def _hold(self, text: str) -> None:
        if text:
            self._held.append(text)

    def _committed(self) -> bool:
        return self._obj is not None and self._obj.committed

    def _content(self, text: str, out: list[Event]) -> None:
        """Content, its trailing whitespace held until more follows: whitespace between content and calls
        goes out only between content (the content of an answer with calls is stripped, as a whole)."""
        if not text:
            return
        kept = text.rstrip(_WS)
        if kept:
            # the first content after a call has no whitespace before it
            body = self._ws + kept if self._emitted or not self.calls else kept.lstrip(_WS)
            out.append(Content(body))
            self._ws, self._emitted = text[len(kept):], True
        else:
            self._ws += text


def _partial_suffix(s: str, i: int, word: str) -> int:
    """How many trailing characters of s[i:] could begin `word` (held until the next piece decides)."""
    k = s.rfind("<", max(i, len(s) - len(word) + 1))
    return len(s) - k if k >= 0 and word.startswith(s[k:]) else 0


def _merged(events: Iterable[Event]) -> list[Event]:
    out: list[Event] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, Content) and isinstance(last, Content):
            out[-1] = Content(last.text + e.text)
        elif isinstance(e, ArgsDelta) and isinstance(last, ArgsDelta) and last.index == e.index:
            out[-1] = ArgsDelta(e.index, last.text + e.text)
        else:
            out.append(e)
    return out


def parse(text: str, names: Sequence[str]) -> tuple[str | None, list[dict]]:
    """(content, calls) of a whole answer, through the streaming parser: the text itself when it holds
    no call; otherwise the content around the calls (None when empty) and each call as OpenAI's object."""
    p = CallParser(names)
    events = p.feed(text) + p.finish()
    calls: list[dict] = []
    content: list[str] = []
    for e in events:
        if isinstance(e, CallStart):
            calls.append({"id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}})
        elif isinstance(e, ArgsDelta):
            calls[e.index]["function"]["arguments"] += e.text
        else:
            content.append(e.text)
    if not calls:
        return text, []
    return ("".join(content) or None), calls
