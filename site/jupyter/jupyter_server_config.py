"""JupyterLab's page loads site/jupyter/custom/custom.css (the course's fixes to third-party
dialogs). A Python config file, beside jupyter_server_config.json, because the path must be
absolute and follow the checkout."""

from pathlib import Path

c = get_config()  # noqa: F821 - traitlets provides it to config files
c.LabApp.custom_css = True
c.ServerApp.static_custom_path = [str(Path(__file__).resolve().parent / "custom")]
