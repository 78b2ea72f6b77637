"""Eight short chat prompts whose greedy answers the engine tests compare between builds."""

SYSTEM = "You are a helpful assistant."
PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Give me a synonym for happy.",
    "Who wrote Romeo and Juliet?",
    "Explain what a CPU does in one sentence.",
    "List the days of the week.",
]
MAX_TOKENS = 24


def conversations() -> list[list[dict]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}] for p in PROMPTS]
