"""The errors a bad setting raises: one base class, so the command line reports any of
them as one line, and one subclass per group whose callers catch it by name."""

from __future__ import annotations


class SettingsError(ValueError):
    """An environment variable holds a value Falcon-ES cannot use."""


class ObservabilityConfigError(SettingsError):
    """A FALCON_HEALTH_* / FALCON_LOG_* variable holds an unusable value."""


class LeaseConfigError(SettingsError):
    """The lease settings cannot give a safe election (says which value and why)."""
