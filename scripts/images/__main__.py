"""``python3 -m scripts.images {build,lock,verify,list,clean}``."""

from __future__ import annotations

import argparse
import subprocess
import sys

from .progress import ImageBuildError, log


def main(argv: list[str] | None = None) -> int:
    from .specs import IMAGES

    parser = argparse.ArgumentParser(
        prog="python3 -m scripts.images",
        description="Build the project's images without Docker (buildah, mmdebstrap, a wheelhouse).",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build images into archives (no-op when current)")
    b.add_argument("names", nargs="*", metavar="NAME",
                   help=f"images to build (default: all of {', '.join(IMAGES)})")
    b.add_argument("--force", action="store_true", help="rebuild even when the archive is current")
    b.add_argument("--verify", action="store_true", help="run each image's smoke check after")
    lk = sub.add_parser("lock", help="resolve the pins into scripts/images/constraints/ (needs PyPI)")
    lk.add_argument("locks", nargs="*", metavar="LOCK", help="only these locks (default: all)")
    v = sub.add_parser("verify", help="run the smoke checks of built images")
    v.add_argument("names", nargs="*", metavar="NAME")
    sub.add_parser("list", help="the archives there are")
    sub.add_parser("clean", help="remove buildah's containers and untagged images (the layer cache: the next build is cold)")
    args = parser.parse_args(argv)

    from .image import archives, build
    from .tools import unavailable_reason
    from .verify import verify

    try:
        if args.cmd == "lock":
            from .lock import lock

            lock(only=tuple(args.locks))
            return 0
        if args.cmd == "list":
            for name, path in archives().items():
                print(f"{name}\t{path}")
            return 0
        reason = unavailable_reason()
        if reason:
            print(f"error: {reason}", file=sys.stderr)
            return 1
        if args.cmd == "clean":
            subprocess.run(["buildah", "rm", "--all"], check=False)
            subprocess.run(["buildah", "rmi", "--prune"], check=False)
            return 0
        names = args.names or list(IMAGES)
        unknown = [n for n in names if n not in IMAGES]
        if unknown:
            print(f"error: unknown image {unknown}; choose from {', '.join(IMAGES)}", file=sys.stderr)
            return 2
        for i, name in enumerate(names, 1):
            if args.cmd == "build":
                log(f"[{i}/{len(names)}] {name}")
                print(build(name, force=args.force))
            if args.cmd == "verify" or args.verify:
                verify(name)
    except (ImageBuildError, AssertionError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
