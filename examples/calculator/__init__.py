"""A calculator-tool agent for the arithmetic prompts: tool specs and the tool (Miles' contracts)."""
