"""The version of loaderdoctor (as pyproject.toml says), readable by every module without importing the
package's public face."""

__version__ = "0.1.0"
