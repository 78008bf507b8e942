"""Multi-turn token records and tool calls (pure): what the chat sessions of `grpolab serve`, the
multi-turn rollout and `grpolab check turns` share.

`record.py` keeps each turn's exact ids (the last turn's ids plus only the new messages, tokenised,
with the template's boundary tokens); `tool_calls.py` reads `<tool_call>{json}</tool_call>` blocks.
"""
