"""Engine adapters: other engines behind the interfaces our measurements and the agent use.

llama.cpp as a token-in, logits-out engine (:mod:`.llamacpp`) and as a tool-calling chat
callable (:mod:`.llamacpp_chat`), and the chat contract every chat callable keeps
(:mod:`.chat`). This layer imports only common and core modules: never the measurements,
the doc generators or the agent, which all import it.
"""
