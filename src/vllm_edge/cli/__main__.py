"""``python -m vllm_edge.cli``: the same as the ``vllm-edge`` command."""

import sys

from vllm_edge.cli import main

sys.exit(main())
