#!/usr/bin/env python3
"""Start, inspect or stop a disaggregated deployment (LLM server + token2wav tritonservers); see --help."""

import sys

from tritontts.triton.disaggregated.cli import main

if __name__ == "__main__":
    sys.exit(main())
