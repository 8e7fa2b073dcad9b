"""The subcommands that belong to no one package: `run`, the role processes (`trainer`,
`worker`, `validator`), `eval` and `init-model`, and a member's view of a pool (`status`,
`pool`). Each module's `register(sub)` adds its parser to `swarmrl` (`cli.py`)."""
