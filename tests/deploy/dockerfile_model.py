"""The Dockerfile as stages, read with the `dockerfile` package (BuildKit's own Go parser)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import dockerfile

from tests.deploy.support import REPO


@dataclass
class Stage:
    name: str
    base: str
    commands: list[dockerfile.Command] = field(default_factory=list)

    def all(self, cmd: str) -> list[dockerfile.Command]:
        return [c for c in self.commands if c.cmd == cmd]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in self.all("ENV"):
            out.update(zip(c.value[::2], c.value[1::2], strict=True))
        return out

    def apt_packages(self) -> set[str]:
        pkgs: set[str] = set()
        for run in self.all("RUN"):
            for part in " ".join(run.value).split("&&"):
                words = shlex.split(part)
                if words[:2] in (["apt-get", "install"], ["apt", "install"]):
                    pkgs |= {w for w in words[2:] if not w.startswith("-")}
        return pkgs


@dataclass
class ParsedDockerfile:
    global_args: dict[str, str | None]
    stages: dict[str, Stage]


def parse(path=REPO / "Dockerfile") -> ParsedDockerfile:
    global_args: dict[str, str | None] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for c in dockerfile.parse_file(str(path)):
        if c.cmd == "FROM":
            words = list(c.value)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"#{len(stages)}"
            current = stages[name] = Stage(name=name, base=words[0])
        elif current is None and c.cmd == "ARG":
            key, _, default = c.value[0].partition("=")
            global_args[key] = default or None
        elif current is not None:
            current.commands.append(c)
    return ParsedDockerfile(global_args, stages)
