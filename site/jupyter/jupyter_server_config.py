"""JupyterLab's page loads site/jupyter/custom/custom.css (the course's fixes to third-party
dialogs). A Python config file, beside jupyter_server_config.json, because the folder must be
an absolute path that follows the checkout. ``static_custom_path`` is not a configurable
trait, so it goes in as a tornado setting, which the server applies over its own."""

from pathlib import Path

c = get_config()  # noqa: F821 - traitlets provides it to config files
c.LabApp.custom_css = True
c.ServerApp.tornado_settings = {
    "static_custom_path": [str(Path(__file__).resolve().parent / "custom")]}
