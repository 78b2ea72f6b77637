"""Speech out: a talker checkpoint that emits codec frames through vLLM, and the codec decoder
that turns those frames into audio chunk by chunk (docs/guide/speech.md)."""
