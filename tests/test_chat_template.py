"""Chat templates rendered as transformers renders them (sandboxed jinja2, trim/lstrip blocks, tojson, raise_exception,
strftime_now), the shipped GLM-4.5-style template against a naive restatement of the GLM layout, and which template
a server picks."""
from datetime import datetime

import pytest

from nextn.runtime.server.chat_template import ChatTemplate
from nextn.runtime.server.errors import ApiError


def glm_layout(messages, add_generation_prompt=True, enable_thinking=None) -> str:
    """GLM-4.5's prompt layout written out by hand: '[gMASK]<sop>', then per message its role marker, a newline and
    the text; an assistant turn carries an empty <think></think> before its text; /nothink closes a user turn when
    thinking is off; the generation prompt is the assistant marker."""
    s = "[gMASK]<sop>"
    for m in messages:
        if m["role"] == "assistant":
            s += "<|assistant|>\n<think></think>\n" + m["content"]
        else:
            s += f"<|{m['role']}|>\n" + m["content"]
            if m["role"] == "user" and enable_thinking is False:
                s += "/nothink"
    if add_generation_prompt:
        s += "<|assistant|>" + ("\n<think></think>" if enable_thinking is False else "")
    return s


CONV = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list ü?"},
        {"role": "assistant", "content": "Use sorted(xs)."}, {"role": "user", "content": "In place?"}]


@pytest.mark.parametrize("agp,think", [(True, None), (False, None), (True, False), (True, True)])
def test_shipped_template_follows_the_glm_layout(agp, think):
    t = ChatTemplate.load({}, None)
    kw = {} if think is None else {"enable_thinking": think}
    assert t.render(CONV, add_generation_prompt=agp, **kw) == glm_layout(CONV, agp, think)


def test_content_parts_and_tool_results():
    t = ChatTemplate.load({}, None)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert t.render(parts) == glm_layout([{"role": "user", "content": "a\nb"}])
    tool = [{"role": "user", "content": "t?"}, {"role": "tool", "content": "21C"}, {"role": "tool", "content": "22C"}]
    out = t.render(tool)
    assert out.count("<|observation|>") == 1 and out.endswith(
        "<|observation|>\n<tool_response>\n21C\n</tool_response>\n<tool_response>\n22C\n</tool_response><|assistant|>")
    with pytest.raises(ApiError, match="non-assistant messages must contain 'content'"):
        t.render([{"role": "user"}])
    with pytest.raises(ApiError, match="Unknown message role"):
        t.render([{"role": "robot", "content": "x"}])


def test_environment_matches_transformers():
    src = ("{% for m in messages %}\n  {% if m.content %}{{ m.content | tojson }}|{{ m.content | tojson(ensure_ascii=True) }}"
           "{% endif %}\n{% endfor %}{{ strftime_now('%Y') }}{% if bos_token %}{{ bos_token }}{% endif %}")
    t = ChatTemplate(src, "test", bos_token="[gMASK]")
    out = t.render([{"role": "user", "content": "é<b>"}])
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one;
    # tojson is json.dumps: no HTML escaping, ensure_ascii only when asked
    assert out == '"é<b>"|"\\u00e9<b>"' + str(datetime.now().year) + "[gMASK]"
    boom = ChatTemplate("{{ raise_exception('no system role here') }}", "test")
    with pytest.raises(ApiError, match="no system role here"):
        boom.render([])
    sandboxed = ChatTemplate("{{ messages.__class__.__mro__ }}", "test")
    with pytest.raises(ApiError, match="unsafe"):       # the sandbox refuses Python internals
        sandboxed.render([])


def test_which_template(tmp_path):
    assert ChatTemplate.load({"tokenizer.chat_template": "G{{ messages | length }}"}, None).render([]) == "G0"
    f = tmp_path / "t.jinja"
    f.write_text("F{{ add_generation_prompt }}")
    assert ChatTemplate.load({"tokenizer.chat_template": "G"}, str(f)).render([]) == "FTrue"
    assert "shipped" not in ChatTemplate.load({}, None).origin and "glm4.jinja" in ChatTemplate.load({}, None).origin
