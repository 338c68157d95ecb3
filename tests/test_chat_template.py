"""Chat templates render the text transformers' ``apply_chat_template(..., tokenize=False)``
renders for the same messages and special tokens, and a hostile template is refused in one line
within its bounds (steps, text size), never by running away."""

from __future__ import annotations

import json

import pytest
from conftest import optional

from glassllm.chat_template import MAX_OUTPUT_CHARS, ChatTemplate, ChatTemplateError

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama-3's habits: bos_token, a date from strftime_now, namespace, whitespace control, block
# tags on their own indented lines (trim_blocks and lstrip_blocks decide what they leave)
LLAMA3_LIKE = """{{- bos_token }}
{%- set ns = namespace(system='') %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
<|start_header_id|>system<|end_header_id|>

Today Date: {{ strftime_now("%d %b %Y") }}
{{ ns.system }}<|eot_id|>
{% for message in messages %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('roles are user or assistant, not ' + message['role']) }}
    {% endif %}
    <|start_header_id|>{{ message['role'] }}<|end_header_id|>

    {{ message['content'] | trim }}<|eot_id|>
    {% if loop.index > 6 %}{% break %}{% endif %}
{% endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"""
# Qwen's habits: tools, tojson, a variable from the caller, the generation tag, dict()
QWEN_LIKE = """{%- if tools %}{{ '<tools>' + (tools | tojson) + '</tools>' }}{% endif %}
{%- for m in messages %}
{%- set meta = dict(role=m.role, n=loop.index) %}
<|im_start|>{{ meta.role }}{{ ' #' ~ meta.n }}
{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{
m.content | tojson }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking
%}<think>\n\n</think>\n\n{% endif %}{% endif %}"""

TEMPLATES = {"smollm2": SMOLLM2, "llama3-like": LLAMA3_LIKE, "qwen-like": QWEN_LIKE}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": 'Ünïcödé ✓ <b>&</b> "q"'},
        {"role": "assistant", "content": "Sure.\n"},
        {"role": "user", "content": "{{ not a template }}", "name": None},
    ],
]
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A transformers tokenizer whose named special tokens are SPECIALS."""
    transformers = optional("transformers")
    optional("jinja2")
    from tokenizers import Tokenizer, models

    vocab = {t: i for i, t in enumerate([*SPECIALS.values(), "a"]) if t}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIALS)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_renders_as_apply_chat_template(hf_tokenizer, name, index, generation_prompt):
    messages = CONVERSATIONS[index]
    expected = hf_tokenizer.apply_chat_template(
        messages,
        chat_template=TEMPLATES[name],
        add_generation_prompt=generation_prompt,
        tokenize=False,
    )
    text = ChatTemplate(TEMPLATES[name], SPECIALS).render(messages, generation_prompt)
    assert text == expected
    assert "<s>" in text or name != "llama3-like"


def test_variables_and_tools_reach_the_template(hf_tokenizer):
    messages = CONVERSATIONS[0]
    for variables in ({"enable_thinking": False}, {"enable_thinking": True}, {}):
        expected = hf_tokenizer.apply_chat_template(
            messages, chat_template=QWEN_LIKE, add_generation_prompt=True, tokenize=False,
            **variables,
        )  # fmt: skip
        assert ChatTemplate(QWEN_LIKE, SPECIALS).render(messages, **variables) == expected
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": "é"}}}]
    expected = hf_tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=QWEN_LIKE, tokenize=False
    )
    text = ChatTemplate(QWEN_LIKE, SPECIALS).render(messages, False, tools=tools)
    assert text == expected and json.dumps(tools, ensure_ascii=False) in text


def test_raise_exception_is_one_line():
    optional("jinja2")
    messages = [{"role": "tool", "content": "x"}]
    with pytest.raises(ChatTemplateError, match="refused the conversation: roles are user or"):
        ChatTemplate(LLAMA3_LIKE, SPECIALS).render(messages)


HOSTILE = {
    "endless loops": (
        "{% for i in range(99999) %}{% for j in range(99999) %}{{ '' }}{% endfor %}{% endfor %}",
        "steps",
    ),
    "a huge output": ("{% for i in range(99999) %}{{ 'x' * 99 }}{% endfor %}", "characters"),
    "a huge repetition": ("{{ 'x' * 10**12 }}", "characters"),
    "doubling by ~": (
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        "characters",
    ),
    "padding": ("{{ 'a' | center(10**10) }}", "characters"),
    "indenting": ("{{ 'a\nb' | indent(width=10**10) }}", "characters"),
    "a format width": ("{{ '{:>99999999999}'.format('a') }}", "characters"),
    "a format width argument": ("{{ '{:>{}}'.format('a', 10**11) }}", "characters"),
    "printf width": ("{{ '%099999999999d' % 1 }}", "characters"),
    "a huge power": ("{{ (2 ** 1000) ** 1000000 }}", "power"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    "attribute access": ("{{ messages.__class__.__base__.__subclasses__() }}", "sandbox"),
    "namespace internals": ("{% set ns = namespace(__dict__=1) %}", "sandbox"),
    "a syntax error": ("{% for %}", "not valid Jinja"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_is_refused_in_one_line(name):
    optional("jinja2")
    source, words = HOSTILE[name]
    with pytest.raises(ChatTemplateError) as caught:
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    message = str(caught.value)
    assert "\n" not in message and words in message, message


def test_the_bounds_leave_real_conversations_alone():
    optional("jinja2")
    long = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "w " * 500} for i in range(401)
    ]
    text = ChatTemplate(SMOLLM2).render(long)
    assert len(text) > 400_000 and len(text) < MAX_OUTPUT_CHARS


def test_bad_messages():
    optional("jinja2")
    template = ChatTemplate(SMOLLM2)
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        template.render([])
    with pytest.raises(ChatTemplateError, match="must be a dict"):
        template.render(["hi"])
    with pytest.raises(ChatTemplateError, match="holds a object, not JSON"):
        template.render([{"role": "user", "content": object()}])


def test_from_directory(tmp_path):
    config = {"chat_template": SMOLLM2, "eos_token": {"content": "<|im_end|>"}, "bos_token": "<s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = ChatTemplate.from_directory(tmp_path)
    assert template.source == SMOLLM2
    assert dict(template.special_tokens) == {"eos_token": "<|im_end|>", "bos_token": "<s>"}
    (tmp_path / "chat_template.jinja").write_text(QWEN_LIKE)  # transformers 5 writes this file
    assert ChatTemplate.from_directory(tmp_path).source == QWEN_LIKE
    named = {
        "chat_template": [
            {"name": "tool_use", "template": "x"},
            {"name": "default", "template": "y"},
        ]
    }
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer_config.json").write_text(json.dumps(named))
    assert ChatTemplate.from_directory(other).source == "y"
    assert ChatTemplate.from_directory(tmp_path / "missing") is None


def test_without_jinja_one_line_names_the_extra(monkeypatch):
    import builtins

    from glassllm import chat_template
    from glassllm.data.bpe import MissingDependencyError

    real_import = builtins.__import__

    def no_jinja(name, *args, **kwargs):
        if name.startswith("jinja2"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_jinja)
    chat_template._environment.cache_clear()
    chat_template._compiled.cache_clear()
    try:
        with pytest.raises(MissingDependencyError, match=r"pip install -e '\.\[chat\]'"):
            ChatTemplate(SMOLLM2).render([{"role": "user", "content": "hi"}])
    finally:
        monkeypatch.undo()
        chat_template._environment.cache_clear()
        chat_template._compiled.cache_clear()
