"""Edge levers: hardware probe, threads, memory release, KV pricing, weight path."""
