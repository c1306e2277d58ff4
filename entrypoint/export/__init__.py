"""EXPORT: deployable copies of ``best.pt`` made at the end of a finished run, each checked by its own runtime
against the ``.pt`` before it is published beside it (docs/configuration.md, "Exported models")."""
