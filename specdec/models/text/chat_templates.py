"""Chat templates by name, and which template a model's chats go through.

The rule, the same for `generate`, `serve`, `bench` and `specdec.load`: a template chosen with `--chat-template
NAME|FILE` (`chat_template=` in Python) wins; else the model's own (tokenizer_config.json, chat_template.jinja, a
GGUF's tokenizer.chat_template); else none, and each command says so (serve refuses chat requests with a 400,
generate and bench send raw text and print one line).

    chosen = read_chat_template("gemma")           # before the model loads: a bad name or file is one line
    label = use_chat_template(tokenizer, chosen)   # after: in force, checked on a sample chat; "gemma (built-in)"

The built-ins are written here from each family's published prompt format; each writes the bos token where the
family's own template does, handles a system message as the family does, and ends with the assistant's turn
header when add_generation_prompt is set. They are rendered by the same Jinja sandbox as a model's own template
(tokenizer.render_chat_template), and tests/test_chat_templates.py checks each against transformers'
apply_chat_template on the same text.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.text.tokenizer import render_chat_template


@dataclass(frozen=True)
class Builtin:
    template: str  # Jinja, over messages, add_generation_prompt, bos_token, eos_token
    families: str  # the model families whose instruct models were trained on this format
    markers: tuple[str, ...] = ()  # special tokens it writes: a vocabulary without them is another family's


# ChatML: every role is a turn of its own; no bos. Qwen's and SmolLM2's own templates add a default system
# message when there is none: this one adds nothing.
CHATML = r"""
{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}
"""

# Llama 3: bos, then a header per turn (the system role included), content trimmed, <|eot_id|> after each.
LLAMA3 = r"""
{{- bos_token -}}
{%- for message in messages -%}
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (message['content'] | trim) + '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif -%}
"""

# The families below have no system role: a system message's text goes into the next user turn (Llama 2 inside
# <<SYS>> tags; Mistral and Gemma before the user's text, after a blank line), and a system message with no user
# turn after it becomes a user turn of its own.

# Llama 2: each exchange is bos [INST] user [/INST] answer eos; the generation prompt is the open exchange itself.
LLAMA2 = r"""
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + (message['content'] | trim) -%}
{%- elif message['role'] == 'user' -%}
{%- set text = message['content'] | trim -%}
{%- if ns.system -%}{%- set text = '<<SYS>>\n' + ns.system + '\n<</SYS>>\n\n' + text -%}{%- endif -%}
{%- set ns.system = '' -%}
{{ bos_token + '[INST] ' + text + ' [/INST]' }}
{%- elif message['role'] == 'assistant' -%}
{{ ' ' + (message['content'] | trim) + ' ' + eos_token }}
{%- else -%}
{{ raise_exception('the llama2 template knows the roles system, user and assistant, not ' + message['role']) }}
{%- endif -%}
{%- endfor -%}
{%- if ns.system -%}{{ bos_token + '[INST] <<SYS>>\n' + ns.system + '\n<</SYS>>\n\n [/INST]' }}{%- endif -%}
"""

# Mistral / Mixtral instruct: one bos, [INST] user [/INST] then the answer and eos, no space between.
MISTRAL = r"""
{{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + message['content'] + '\n\n' -%}
{%- elif message['role'] == 'user' -%}
{{ '[INST] ' + ns.system + message['content'] + ' [/INST]' }}
{%- set ns.system = '' -%}
{%- elif message['role'] == 'assistant' -%}
{{ message['content'] + eos_token }}
{%- else -%}
{{ raise_exception('the mistral template knows the roles system, user and assistant, not ' + message['role']) }}
{%- endif -%}
{%- endfor -%}
{%- if ns.system -%}{{ '[INST] ' + (ns.system | trim) + ' [/INST]' }}{%- endif -%}
"""

# Gemma 2 and 3: bos, turns of user and model (the assistant), content trimmed. Gemma 3's own template puts the
# system text before the first user turn's; Gemma 2's refuses a system message. This one does as Gemma 3's.
GEMMA = r"""
{{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + (message['content'] | trim) + '\n\n' -%}
{%- elif message['role'] == 'user' -%}
{{ '<start_of_turn>user\n' + ns.system + (message['content'] | trim) + '<end_of_turn>\n' }}
{%- set ns.system = '' -%}
{%- elif message['role'] == 'assistant' -%}
{{ '<start_of_turn>model\n' + (message['content'] | trim) + '<end_of_turn>\n' }}
{%- else -%}
{{ raise_exception('the gemma template knows the roles system, user and assistant, not ' + message['role']) }}
{%- endif -%}
{%- endfor -%}
{%- if ns.system -%}{{ '<start_of_turn>user\n' + (ns.system | trim) + '<end_of_turn>\n' }}{%- endif -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}
"""

# Phi-3 and Phi-3.5: <|role|> on its own line, <|end|> after each turn (the system role included); no bos.
PHI3 = r"""
{%- for message in messages -%}
{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}
"""

BUILTINS: dict[str, Builtin] = {
    "chatml": Builtin(CHATML, "Qwen2, Qwen2.5, Qwen3 (without its thinking switch), SmolLM2, and other ChatML "
                              "fine-tunes", ("<|im_start|>", "<|im_end|>")),
    "llama3": Builtin(LLAMA3, "Llama 3, 3.1, 3.2 and 3.3 instruct (plain turns: no tool calls, no date header)",
                      ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "llama2": Builtin(LLAMA2, "Llama 2 chat, and models tuned on its [INST] <<SYS>> format"),
    "mistral": Builtin(MISTRAL, "Mistral 7B and Mixtral instruct ([INST] turns, no system role)"),
    "gemma": Builtin(GEMMA, "Gemma 2 and Gemma 3 instruct", ("<start_of_turn>", "<end_of_turn>")),
    "phi3": Builtin(PHI3, "Phi-3 and Phi-3.5 instruct", ("<|user|>", "<|assistant|>", "<|end|>")),
}

# What every template in force must render at start: a system message, a finished exchange, a new question.
SAMPLE_CHAT = ({"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
               {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one, please?"})
SAMPLE_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}  # before the model loads: placeholders


@dataclass(frozen=True)
class ChatTemplate:
    """A template chosen by the user: its Jinja text and the name the start line gives it."""

    text: str
    label: str  # "gemma (built-in)", "chat.jinja (file)"
    markers: tuple[str, ...] = ()  # a built-in's special tokens, checked against the model's vocabulary


def builtin_names() -> str:
    return ", ".join(BUILTINS)


def read_chat_template(choice: str | None, flag: str = "--chat-template") -> ChatTemplate | None:
    """--chat-template NAME|FILE: a built-in by name, else the path of a Jinja file; None: not given. Checked
    before any model loads: an unknown name, a file that cannot be read, a template that does not compile or
    does not render a sample chat (with a system message) are each refused in one line."""
    if choice is None:
        return None
    given = f"{flag}{choice}" if flag.endswith("=") else f"{flag} {choice}"
    if choice in BUILTINS:
        b = BUILTINS[choice]
        return ChatTemplate(b.template, f"{choice} (built-in)", b.markers)
    path = Path(choice).expanduser()
    if not path.exists():
        if path.suffix or "/" in choice or "\\" in choice:
            raise SpecdecError(f"{given}: no such file")
        raise SpecdecError(f"{given}: no built-in template of that name (built-in: "
                           f"{builtin_names()}; or give the path of a Jinja template file)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:  # a folder, no permission, bytes that are not UTF-8
        raise SpecdecError(f"{given}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise SpecdecError(f"{given}: the file is empty")
    chosen = ChatTemplate(text, f"{choice} (file)")
    check_renders(text, SAMPLE_SPECIALS, given)
    return chosen


def check_renders(template: str, specials: dict[str, str], name: str) -> None:
    """The template compiles and renders the sample chat, with the conversation's text in it. A template that
    refuses a system message on purpose (Gemma 2's own raises an error for one) passes when it renders the chat
    without it: a request with one then gets the template's own message, as a 400."""
    last = SAMPLE_CHAT[-1]["content"]
    try:
        out = render_chat_template(template, list(SAMPLE_CHAT), True, specials)
    except SpecdecError as first:
        try:
            out = render_chat_template(template, list(SAMPLE_CHAT[1:]), True, specials)
        except SpecdecError:
            raise SpecdecError(f"{name}: {first} (on a sample chat of system, user, assistant, user)") from None
    if last not in out:
        raise SpecdecError(f"{name}: the rendered sample chat does not contain its last message, so this is not "
                           f"a chat template (it rendered {out[:80]!r})")


def use_chat_template(tokenizer, chosen: ChatTemplate | None, how: str = "--chat-template NAME|FILE") -> str:
    """Put the template in force on `tokenizer` (chosen wins over the model's own), check it renders the sample
    chat with the model's own special tokens, and return how to name it: "gemma (built-in)", "the model's own",
    or "none". A built-in whose turn markers are not tokens of this vocabulary is said in one warning line."""
    if chosen is not None:
        tokenizer.set_chat_template(chosen.text)
        check_renders(chosen.text, tokenizer.special_tokens, f"chat template {chosen.label}")
        missing = [m for m in chosen.markers if m not in special_tokens_of(tokenizer)]
        if missing:
            print(f"specdec: warning: chat template {chosen.label} writes {missing[0]}, which this model's "
                  f"vocabulary does not hold as a special token: it was not trained on this format"
                  f"{suggestion(tokenizer, ', ')}", file=sys.stderr)
        return chosen.label
    if not tokenizer.chat_template:
        return "none"
    check_renders(tokenizer.chat_template, tokenizer.special_tokens,
                  f"the model's own chat template (give {how} in its place)")
    return "the model's own"


def special_tokens_of(tokenizer) -> set[str]:
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return set()
    return {t.content for t in backend.get_added_tokens_decoder().values() if t.special}


def suggestion(tokenizer, lead: str = "") -> str:
    """", gemma fits this vocabulary" when one built-in's turn markers are all special tokens of it, else ""."""
    specials = special_tokens_of(tokenizer)
    fits = [n for n, b in BUILTINS.items() if b.markers and all(m in specials for m in b.markers)]
    return f"{lead}{fits[0]} fits this vocabulary" if fits else ""


def no_template_line(tokenizer, consequence: str, how: str = "give --chat-template NAME|FILE", after: str = "") -> str:
    """The one line said where a chat goes as raw text, or is refused, for want of a template."""
    return (f"this model has no chat template, so {consequence}: {how} (built-in: {builtin_names()}"
            f"{suggestion(tokenizer, '; ')}){after}")
