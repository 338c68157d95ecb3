"""Chat templates: the Jinja program a chat model ships to turn messages into its prompt,
rendered exactly as transformers' ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True, tokenize=False)`` renders it.

transformers' recipe (``transformers.utils.chat_template_utils``), followed here:
``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the
``loopcontrols`` extension and a ``{% generation %}`` block that renders its body; a ``tojson``
filter that is ``json.dumps`` (no HTML escaping, ``ensure_ascii=False``); the globals
``raise_exception(message)``, ``strftime_now(format)``, ``dict`` and a ``namespace`` that refuses
underscore names; rendered with ``messages``, ``tools=None``, ``documents=None``,
``add_generation_prompt`` and the tokenizer's named special tokens (``bos_token``, ``eos_token``,
``unk_token``, ``pad_token``); keys whose value is None dropped from each message.

A template comes from a file (a GGUF's metadata, a Hugging Face ``tokenizer_config.json``) and
is untrusted code. The sandbox refuses attribute access to Python's internals; on top of it a
render is bounded: at most MAX_STEPS template lines run (no loop runs forever), the text it
builds (``*``, ``+``, ``~``, ``%``, padding calls) and its output stay under MAX_OUTPUT_CHARS.
Any breach, a syntax error or ``raise_exception`` is one `ChatTemplateError` line.

Jinja2 is the optional ``chat`` extra (``pip install -e '.[chat]'`` in the checkout), imported
at the first render.

>>> template = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
...                         "{% if add_generation_prompt %}<assistant>{% endif %}")
>>> template.render([{"role": "user", "content": "Hi"}])              # doctest: +SKIP
'<user>Hi<assistant>'
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from glassllm._install import install_hint
from glassllm.data.bpe import MissingDependencyError

INSTALL_HINT = install_hint("chat")
MIN_JINJA = (3, 1, 6)  # older versions have known sandbox escapes (transformers refuses them too)
MAX_STEPS = 200_000  # template lines one render may run
MAX_OUTPUT_CHARS = 4 * 2**20  # characters of any text a render builds, the output included
MAX_TEMPLATE_CHARS = 1 * 2**20
TEMPLATE_FILE = "chat_template.jinja"  # transformers 5 writes the template beside the tokenizer
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template that cannot render these messages (one line)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A chat template's Jinja ``source`` and the named special tokens it is rendered with."""

    source: str
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text of ``messages`` (each a dict with ``role`` and ``content``), as
        ``apply_chat_template(messages, add_generation_prompt=..., tokenize=False)`` gives it;
        ``tools`` (JSON schemas), ``documents`` and ``variables`` are passed to the template too
        (e.g. ``enable_thinking=False``)."""
        if not messages:
            raise ChatTemplateError(
                "cannot render an empty conversation: give at least one message"
            )
        chat = _aliased([_plain_message(m) for m in messages])
        context = {
            **{k: str(v) for k, v in self.special_tokens.items()},
            **_plain(variables, "a template variable"),
        }
        template = _compiled(self.source)
        return _render(
            template,
            dict(
                context,
                messages=chat,
                tools=None if tools is None else _plain(list(tools), "a tool"),
                documents=None if documents is None else _plain(list(documents), "a document"),
                add_generation_prompt=bool(add_generation_prompt),
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """The template as JSON-able values (a checkpoint's metadata stores it so)."""
        return {"source": self.source, "special_tokens": dict(self.special_tokens)}

    @classmethod
    def from_dict(cls, values: Any) -> ChatTemplate:
        """Inverse of `to_dict`; a ValueError naming what is wrong with ``values`` (untrusted)."""
        if not isinstance(values, dict) or set(values) != {"source", "special_tokens"}:
            raise ValueError("a chat template is an object of 'source' and 'special_tokens'")
        source, tokens = values["source"], values["special_tokens"]
        if not isinstance(source, str) or len(source) > MAX_TEMPLATE_CHARS:
            raise ValueError(
                f"its source is not a text of at most {MAX_TEMPLATE_CHARS:,} characters"
            )
        if not isinstance(tokens, dict) or not all(
            name in SPECIAL_TOKEN_NAMES and isinstance(token, str) for name, token in tokens.items()
        ):
            raise ValueError(f"its special_tokens must map some of {SPECIAL_TOKEN_NAMES} to texts")
        return cls(source, dict(tokens))

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> ChatTemplate | None:
        """The chat template of a Hugging Face model directory: ``chat_template.jinja``, else
        ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates of
        which ``default`` is taken); the special tokens from ``tokenizer_config.json``. None when
        the directory has no template."""
        from glassllm._untrusted import HFFormatError, read_json

        directory = Path(directory)
        config_path = directory / TOKENIZER_CONFIG
        config = read_json(config_path) if config_path.is_file() else {}
        if not isinstance(config, dict):
            raise HFFormatError(str(config_path), ["not a JSON object"])
        source = config.get("chat_template")
        if (directory / TEMPLATE_FILE).is_file():
            source = _read_text(directory / TEMPLATE_FILE)
        if isinstance(
            source, list
        ):  # [{"name": "default", "template": ...}, {"name": "tool_use"...}]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if source is None:
            return None
        if not isinstance(source, str) or len(source) > MAX_TEMPLATE_CHARS:
            raise HFFormatError(
                str(config_path),
                [f"chat_template is not a text of at most {MAX_TEMPLATE_CHARS:,} characters"],
            )
        tokens = {}
        for name in SPECIAL_TOKEN_NAMES:
            value = config.get(name)
            if isinstance(value, dict):  # a serialised AddedToken
                value = value.get("content")
            if isinstance(value, str):
                tokens[name] = value
        return cls(source, tokens)


def _read_text(path: Path) -> str:
    from glassllm._untrusted import HFFormatError

    try:
        if path.stat().st_size > MAX_TEMPLATE_CHARS * 4:
            raise HFFormatError(str(path), [f"larger than {MAX_TEMPLATE_CHARS * 4:,} bytes"])
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise HFFormatError(str(path), [f"unreadable ({err})"]) from None


# ---------------------------------------------------------------------------- the data


def _plain(value: Any, what: str, depth: int = 0) -> Any:
    """``value`` rebuilt from JSON's types (str, int, float, bool, None, list, dict): nothing
    with methods of its own reaches the template."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth > 32:
        raise ChatTemplateError(f"{what} is nested too deeply")
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, what, depth + 1): _plain(v, what, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, what, depth + 1) for v in value]
    raise ChatTemplateError(f"{what} holds a {type(value).__name__}, not JSON data")


def _plain_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ChatTemplateError(
            f"a chat message must be a dict with role and content, got {type(message).__name__}"
        )
    return {k: v for k, v in _plain(message, "a chat message").items() if v is not None}


def _aliased(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """transformers' aliases of a message's reasoning: ``thinking`` and ``reasoning_content``."""
    out = []
    for message in chat:
        reasoning = next(
            (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


# ---------------------------------------------------------------------------- Jinja


def _import_jinja() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise MissingDependencyError(
            f"chat templates need the Jinja2 package: {INSTALL_HINT}"
        ) from None
    version = tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3])
    if version < MIN_JINJA:
        raise MissingDependencyError(
            f"chat templates need Jinja2 >= 3.1.6 (older sandboxes have known escapes), found "
            f"{jinja2.__version__}: {INSTALL_HINT}"
        )
    return jinja2


class _Budget:
    """What one render may still spend; `_environment`'s hooks and the line tracer charge it."""

    steps = 0

    @classmethod
    def charge_text(cls, length: int) -> None:
        if length > MAX_OUTPUT_CHARS:
            raise ChatTemplateError(
                f"the chat template builds a text of {length:,} characters, more than the "
                f"{MAX_OUTPUT_CHARS:,} allowed"
            )


@lru_cache(maxsize=1)
def _environment() -> Any:
    jinja2 = _import_jinja()
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def sized(value: Any) -> int:
        return len(value) if isinstance(value, (str, list, tuple)) else 0

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        # intercepted, these are never folded at compile time either
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if sized(seq) and isinstance(n, int):
                        _Budget.charge_text(sized(seq) * max(n, 0))
            elif operator == "+":
                _Budget.charge_text(sized(left) + sized(right))
            elif operator == "**" and _huge_power(left, right):
                raise ChatTemplateError(f"the chat template raises a number to the power {right}")
            elif operator == "%" and isinstance(left, str):
                widths = [int(w) for w in re.findall(r"%[-+ #0]*(\d+)", left)]
                _Budget.charge_text(len(left) + sum(widths))
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            # no call asks for more characters (ljust, center, range...) than allowed
            _charge_sizes((*args, *kwargs.values()))
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:  # '{:>999999999}'.format(x): the width is in the text
                widths = re.findall(r"\{[^{}]*?:[^{}]*?(\d+)", value.__self__)
                _Budget.charge_text(len(value.__self__) + sum(int(w) for w in widths))
            return wrapped

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's text
        with it; rendering it is rendering its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return caller()

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with _")

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    # filters are called directly, not through `call`: each checks its size arguments itself
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def _charge_sizes(values: Any) -> None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            _Budget.charge_text(abs(value))


def _bounded_filter(f: Any) -> Any:
    """``f`` refusing a size argument (``center(10**10)``, ``indent(10**10)``) over the bound
    before it allocates; the filtered value itself (first, after a context) is not a size."""
    skip = 2 if hasattr(f, "jinja_pass_arg") else 1

    @functools.wraps(f)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _charge_sizes((*args[skip:], *kwargs.values()))
        return f(*args, **kwargs)

    return bounded


def _huge_power(base: Any, exponent: Any) -> bool:
    """Whether ``base ** exponent`` is an integer of over a million bits (a float overflows)."""
    if isinstance(base, bool) or not isinstance(base, int) or not isinstance(exponent, int):
        return False
    return abs(base) > 1 and exponent > 0 and base.bit_length() * exponent > 2**20


def _bounded_join(join: Any) -> Any:
    def bounded(parts: Any) -> Any:
        parts = list(parts)
        _Budget.charge_text(sum(len(p) if isinstance(p, str) else 0 for p in parts))
        return join(parts)

    return bounded


@lru_cache(maxsize=16)
def _compiled(source: str) -> Any:
    if not isinstance(source, str):
        raise ChatTemplateError(f"a chat template must be a text, got {type(source).__name__}")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(f"the chat template is over {MAX_TEMPLATE_CHARS:,} characters")
    env = _environment()
    jinja2 = _import_jinja()
    try:
        template = env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise ChatTemplateError(
            f"the chat template is not valid Jinja (line {err.lineno}: {err.message})"
        ) from None
    # ``a ~ b`` compiles to these joins, looked up in the template's own module namespace
    namespace = template.root_render_func.__globals__
    for name in ("str_join", "markup_join"):
        namespace[name] = _bounded_join(namespace[name])
    return template


def _render(template: Any, context: dict[str, Any]) -> str:
    """``template.render(**context)`` within the budget: lines counted by a tracer on the
    template's own code, output counted chunk by chunk."""
    jinja2 = _import_jinja()
    _Budget.steps = MAX_STEPS
    code_file = template.root_render_func.__code__.co_filename

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            _Budget.steps -= 1
            if _Budget.steps < 0:
                raise ChatTemplateError(
                    f"the chat template ran more than {MAX_STEPS:,} steps (a loop without end?)"
                )
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return on_line if frame.f_code.co_filename == code_file else None

    chunks: list[str] = []
    size = 0
    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        pieces: Iterator[str] = template.generate(**context)
        for piece in pieces:
            size += len(piece)
            _Budget.charge_text(size)
            chunks.append(piece)
    except ChatTemplateError:
        raise
    except jinja2.exceptions.SecurityError as err:
        raise ChatTemplateError(
            f"the chat template tried something the sandbox forbids ({err})"
        ) from None
    except jinja2.exceptions.TemplateError as err:
        raise ChatTemplateError(f"the chat template refused the conversation: {err}") from None
    except (RecursionError, MemoryError, OverflowError) as err:
        raise ChatTemplateError(
            f"the chat template cannot be rendered ({type(err).__name__})"
        ) from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as err:
        raise ChatTemplateError(f"the chat template failed: {type(err).__name__}: {err}") from None
    finally:
        sys.settrace(previous)
    return "".join(chunks)
