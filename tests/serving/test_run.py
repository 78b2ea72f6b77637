

def test_the_default_system_message_is_the_embedded_models_own_else_runs_generic():
    from vllm_edge.models import store
    from vllm_edge.serving.run import DEFAULT_SYSTEM, default_system

    text, source = default_system("default")
    assert text == store.resolve_key("default").system == "" and "measured" in source
    assert default_system("/models/some.gguf") == (DEFAULT_SYSTEM, "run's default")
