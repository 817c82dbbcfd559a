"""A trivial Triton kernel that warm children launch once before their job (see child.py)."""

import triton
import triton.language as tl


@triton.jit
def touch(ptr):
    tl.store(ptr, 1.0)
