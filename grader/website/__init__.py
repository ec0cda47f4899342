"""The site's build (lessons executed into mkdocs-jupyter's cache) and its server."""
