"""`python -m compiler.measure ...`: the `memspec measure` command on its own."""

import argparse
import sys

from ..cli_parser import _Parser
from . import cli


def run(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="memspec measure", description=cli.DESCRIPTION, epilog=cli.EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_arguments(parser)
    return cli.main(parser.parse_args(argv))


if __name__ == "__main__":
    from ..cli import measure_hash_seed

    measure_hash_seed(sys.argv[1:], "compiler.measure")
    sys.exit(run())
