"""``cpu_int4``: our W4A16 format (4-bit codes, bf16 scale and offset per group)."""

NAME = "cpu_int4"
