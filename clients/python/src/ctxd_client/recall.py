"""The recall tool: the way back from a placeholder to what a render cleared, cut or stubbed.

Every cleared tool result, cut tool result, stubbed tool-call argument and shortened assistant
text in a ctxd render names what it replaced by a reference, the 12 hexadecimal characters after
the word `recall`:

    [cleared to save context: recall 3f9a2c1b7d04]
    [… 6000 of 10000 characters cut: recall 3f9a2c1b7d04 …]
    …[5120 chars elided: recall 3f9a2c1b7d04]

Register the tool with the model (the definition is a constant here, the same text the server's
`RecallTool` returns, so registering needs no round trip) and answer its calls with
`handle_recall`:

    from ctxd_client import handle_recall, recall_tool_definition

    tools = [recall_tool_definition("openai"), ...]
    ...
    for call in message.tool_calls:
        if call.function.name == "recall":
            result = handle_recall(ctxd, session, call.function.arguments)
            ctxd.append_tool_result(session, call.id, result.text, is_error=result.is_error)

The answer is a new tool result at the tail, so the cached prefix of the context is untouched.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import grpc

from .errors import InvalidArgument, NotFound
from .types import Recalled, Session

if TYPE_CHECKING:
    from .client import Client

__all__ = [
    "RECALL_REFERENCE",
    "RECALL_TOOL_DESCRIPTION",
    "RECALL_TOOL_NAME",
    "RECALL_TOOL_PARAMETERS",
    "RecallToolResult",
    "handle_recall",
    "recall_references",
    "recall_text",
    "recall_tool_definition",
]

RECALL_TOOL_NAME = "recall"
"""The tool's name."""

RECALL_TOOL_DESCRIPTION = (
    "Returns the original content of a tool result, tool call or message that was cleared or "
    "shortened to save context. Pass the reference its placeholder names (the 12 characters "
    "after `recall`)."
)
"""What the model is told the tool does."""

RECALL_TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reference": {
            "type": "string",
            "description": "The 12-character reference after `recall` in a placeholder.",
        }
    },
    "required": ["reference"],
    "additionalProperties": False,
}
"""The JSON schema of the tool's one argument, `reference` (do not modify it: copy it)."""

RECALL_REFERENCE = re.compile(r"recall ([0-9a-f]{12})")
"""Finds the references in rendered text: group 1 is the reference."""

RecallShape = Literal["anthropic", "openai", "responses"]

# The status of the client's own check of a call's arguments, as the server's would be.
_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def recall_tool_definition(shape: RecallShape = "openai") -> dict[str, Any]:
    """The recall tool's definition, as each API takes it in `tools` (a fresh copy each call):

    - `"anthropic"`: Messages API, `{"name", "description", "input_schema"}`
    - `"openai"`: chat completions, `{"type": "function", "function": {"name", ...}}`
    - `"responses"`: Responses API, `{"type": "function", "name", "description", "parameters"}`
    """
    parameters = copy.deepcopy(RECALL_TOOL_PARAMETERS)
    if shape == "anthropic":
        return {
            "name": RECALL_TOOL_NAME,
            "description": RECALL_TOOL_DESCRIPTION,
            "input_schema": parameters,
        }
    if shape == "openai":
        return {
            "type": "function",
            "function": {
                "name": RECALL_TOOL_NAME,
                "description": RECALL_TOOL_DESCRIPTION,
                "parameters": parameters,
            },
        }
    if shape == "responses":
        return {
            "type": "function",
            "name": RECALL_TOOL_NAME,
            "description": RECALL_TOOL_DESCRIPTION,
            "parameters": parameters,
        }
    raise ValueError(f"shape must be one of anthropic, openai, responses, not {shape!r}")


def recall_references(text: str) -> list[str]:
    """Every reference a rendered text names, in order, each once."""
    return list(dict.fromkeys(RECALL_REFERENCE.findall(text)))


def recall_text(recalled: Recalled) -> str:
    """What the model reads as the tool's result: the content, and when it is only its head, a
    last line saying how many characters were left out."""
    if not recalled.truncated:
        return recalled.content
    return (
        f"{recalled.content}\n[… {recalled.chars_left_out} more characters left out: the "
        f"content has {recalled.total_chars} characters, this is its head]"
    )


@dataclass(frozen=True)
class RecallToolResult:
    """The answer to a model's recall call: `text` goes into the tool result, `is_error` says
    whether the call failed (an unknown or malformed reference, or arguments without one)."""

    text: str
    is_error: bool
    recalled: Recalled | None
    """What the server returned (None when the call failed)."""

    def __str__(self) -> str:
        return self.text


def _reference(arguments: Mapping[str, Any] | str) -> str:
    """The `reference` argument of a model's call (arguments as a dict or their JSON text)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise InvalidArgument(
                _INVALID, 'reference: the arguments are not JSON; pass {"reference": "..."}'
            ) from None
    if not isinstance(arguments, Mapping):
        raise InvalidArgument(_INVALID, "reference: the arguments must be a JSON object")
    reference = arguments.get("reference")
    if not isinstance(reference, str):
        raise InvalidArgument(
            _INVALID,
            "reference: is required, a string: the 12 characters after `recall` in a placeholder",
        )
    # A model sometimes copies the placeholder's words with the reference.
    reference = reference.strip()
    return reference.removeprefix("recall ").strip()


def handle_recall(
    client: Client,
    session: Session | str,
    arguments: Mapping[str, Any] | str,
    *,
    max_chars: int | None = None,
) -> RecallToolResult:
    """Runs a model's recall call against `session` and returns the text for its tool result.

    `arguments` is the call's arguments as the model gave them: a dict (Anthropic's `input`) or
    JSON text (OpenAI's `arguments`). A reference the session does not have, a malformed one, or
    arguments without one are answered with `is_error=True` and the reason as text, for the
    model to read; any other failure (the server unreachable, a wrong key) raises.
    """
    try:
        recalled = client.recall(session, _reference(arguments), max_chars=max_chars)
    except (NotFound, InvalidArgument) as e:
        return RecallToolResult(f"recall failed: {e.message}", True, None)
    return RecallToolResult(recall_text(recalled), False, recalled)
