"""The text a run feeds the model: the prompt as given, wrapped in the model's chat template (`--chatml`), and
with the model's reasoning switched off (`--no-think`) by whatever that template offers. No model is loaded:
the template comes from the file's header.

`--chatml` alone goes through llama.cpp's `llama_chat_apply_template`, as it always has: the C API knows a
template by its markers and applies its own built-in form of it, without Jinja and without keyword switches
(for harmony that form has no system message). Its output is kept byte for byte.

`--no-think` needs the template's own switches, so it renders the model's Jinja template in the
Transformers-compatible sandbox of llama-cpp-python (`Jinja2ChatFormatter`: trim_blocks, lstrip_blocks,
raise_exception, tojson, strftime_now), one user message, the generation prompt on, and bos_token/eos_token
empty (llama.cpp's tokenizer adds the BOS itself when the model asks for one). Per template family:

- harmony (gpt-oss; the template has `<|start|>` and `<|channel|>`): rendered with `reasoning_effort="low"`,
  then the assistant turn is prefilled with `<|channel|>final<|message|>`, so generation starts in the final
  channel and the analysis (reasoning) channel is never opened. gpt-oss has no effort that turns reasoning
  off: `low` alone still reasons first, so the prefill is what suppresses it; `low` keeps the system message
  consistent with a model that answers at once.
- `enable_thinking` (Qwen3's switch, also honoured by other templates): rendered with `enable_thinking=false`,
  which Qwen3's template turns into an empty `<think>\\n\\n</think>\\n\\n` opening the assistant turn. Chosen
  over Qwen3's `/no_think` soft switch, which is a request in the user's own text (the prompt changes, and the
  model may or may not follow it); the template switch is the hard one.
- any other template (ChatML without think handling, ...): refused with one line.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from harness.errors import UserError
from harness.formats.partial_import import submodule_alone

HARMONY_FINAL = "<|channel|>final<|message|>"
HARMONY_GEN = "<|start|>assistant"
NO_THINK_HARMONY = "harmony final channel (assistant turn prefilled <|channel|>final<|message|>), reasoning_effort=low"
NO_THINK_SWITCH = "chat template enable_thinking=false"


@dataclass(frozen=True)
class Prompt:
    text: str
    no_think: str = ""  # how reasoning was suppressed (the CSV preamble's no_think); "" when not asked


def build_prompt(model: str, template: str, prompt: str, *, chatml: bool, no_think: bool) -> Prompt:
    """The run's prompt text. `template` is the model's tokenizer.chat_template ("" when it has none);
    `no_think` needs `chatml` (the config refuses it alone). Raises UserError with one line."""
    if not chatml:
        return Prompt(prompt)
    if not template:
        drop = "--chatml and --no-think" if no_think else "--chatml"
        raise UserError(f"{model} has no chat template (tokenizer.chat_template); drop {drop}")
    if not no_think:
        return Prompt(apply_builtin(model, template, prompt))
    return no_think_prompt(model, template, prompt)


def apply_builtin(model: str, template: str, prompt: str) -> str:
    """llama.cpp's built-in form of the template (recognised by its markers), one user message."""
    L = submodule_alone("llama_cpp.llama_cpp")  # the ctypes bindings, without the package's __init__
    msgs = (L.llama_chat_message * 1)()
    msgs[0].role = b"user"
    msgs[0].content = prompt.encode()
    tmpl = template.encode()
    n = 4 * len(prompt) + 1024
    buf = ctypes.create_string_buffer(n)
    got = L.llama_chat_apply_template(tmpl, msgs, 1, True, buf, n)
    if got < 0:
        raise UserError(f"{model}: llama.cpp cannot apply this model's chat template; drop --chatml")
    if got > n:
        buf = ctypes.create_string_buffer(got + 1)
        got = L.llama_chat_apply_template(tmpl, msgs, 1, True, buf, got + 1)
    return buf.raw[:got].decode("utf-8", "replace")


def render(template: str, prompt: str, **switches: object) -> str:
    """The Jinja template rendered for one user message with the generation prompt on."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    fmt = Jinja2ChatFormatter(template, eos_token="", bos_token="", add_generation_prompt=True)
    return fmt(messages=[{"role": "user", "content": prompt}], **switches).prompt


def is_harmony(template: str) -> bool:
    return "<|start|>" in template and "<|channel|>" in template


def no_think_prompt(model: str, template: str, prompt: str) -> Prompt:
    import jinja2  # only --no-think renders a template: off the plain run's imports (harness.formats.partial_import)

    try:
        if is_harmony(template):
            text = render(template, prompt, reasoning_effort="low")
            if not text.endswith(HARMONY_GEN):
                raise UserError(f"{model}: its harmony chat template does not end the prompt with {HARMONY_GEN}, "
                                "so the final channel cannot be prefilled; drop --no-think")
            return Prompt(text + HARMONY_FINAL, NO_THINK_HARMONY)
        off = render(template, prompt, enable_thinking=False)
        if off != render(template, prompt):
            return Prompt(off, NO_THINK_SWITCH)
    except (jinja2.TemplateError, ValueError, TypeError) as e:
        raise UserError(f"{model}: its chat template failed to render ({type(e).__name__}: {e}); "
                        "drop --no-think") from None
    raise UserError(f"{model}: its chat template has no way to switch reasoning off (neither harmony channels "
                    "nor enable_thinking); drop --no-think")
