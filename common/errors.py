"""What ``common`` raises: one hierarchy, each error one line for the user.

In:  nothing.
Out: the error classes::

         ConfigError               a configuration problem, already phrased as one line
         └── YamlConfigError       (ValueError) a YAML file that cannot be read or does not fit its
                                   model: the file, the line and the key in the message

``common.config`` and ``common.yamlfile`` export them under their own names too.
"""

from __future__ import annotations

__all__ = ["ConfigError", "YamlConfigError"]


class ConfigError(Exception):
    """A configuration problem, already phrased as one line for the user."""


class YamlConfigError(ConfigError, ValueError):
    """A configuration file problem, already phrased as one line."""
