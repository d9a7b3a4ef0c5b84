"""Every OpenTelemetry name corral emits, in one place.

The GenAI semantic conventions are still marked *Development* upstream: when a name
changes there, it changes here and nowhere else. Names under ``corral.`` are corral's
own (no convention covers them yet).
"""

# ruff: noqa: S105 - "token" names a metric attribute here, not a secret

from __future__ import annotations

from typing import Final

# ------------------------------------------------------------------ instrumentation scope
SCOPE: Final = "corral"

# ------------------------------------------------------------------ operation names
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_CHAT: Final = "chat"
OP_EXECUTE_TOOL: Final = "execute_tool"

# ------------------------------------------------------------------ span attributes
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
ERROR_TYPE: Final = "error.type"

# Opt-in content (``capture_content=True``): JSON text of the messages.
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"

TOKEN_INPUT: Final = "input"
TOKEN_OUTPUT: Final = "output"

# corral's own attributes.
CORRAL_TURN: Final = "corral.turn"
CORRAL_STEP: Final = "corral.step"
CORRAL_TURN_TRIGGER: Final = "corral.turn.trigger"
CORRAL_TURN_OUTCOME: Final = "corral.turn.outcome"
CORRAL_RETRY_OF: Final = "corral.turn.retry_of"

# The finish reasons as the conventions spell them (corral's FinishReason -> semconv).
FINISH_REASONS: Final = {
    "stop": "stop",
    "tool-calls": "tool_calls",
    "max-tokens": "length",
    "error": "error",
}

# ------------------------------------------------------------------ metrics
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
METRIC_TURNS: Final = "corral.turns"
METRIC_INBOX_DEPTH: Final = "corral.agent.inbox.depth"
METRIC_RUNNING_AGENTS: Final = "corral.agents.running"

# The conventions' advisory bucket boundaries.
TOKEN_BUCKETS: Final = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
DURATION_BUCKETS: Final = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
