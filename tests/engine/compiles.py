"""Count what XLA compiles: the test of 'one compilation'."""

import contextlib
import logging

import jax


class CompileLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling jit("):
            self.names.append(message.split("(")[1].split(")")[0])


@contextlib.contextmanager
def count_compiles():
    """Collect the names of the functions XLA compiles inside the block."""
    handler = CompileLog()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield handler.names
    finally:
        logger.removeHandler(handler)
