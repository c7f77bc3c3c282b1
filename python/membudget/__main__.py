"""python -m membudget COMMAND ...: the membudget command line, run in this interpreter.

Every command of the `membudget` executable (predict, serve, sweep, max-batch, advise, verify,
attribute, oom, leaks) is the same compiled code, so flags, output and exit status are the CLI's.
`measure` is Python's own: it runs the real PyTorch step (membudget.measure) and needs torch.
"""
import sys


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "measure":
        from . import measure

        return measure.main(args[1:])
    from ._core import cli_main

    return cli_main(["membudget", *args])


if __name__ == "__main__":
    sys.exit(main())
