"""The methods: one file per algorithm, each an ``Algorithm`` subclass of the engine's template registered with
``@register("name")``. ``algorithms/__init__.py`` imports every module of this folder, so a new file registers itself
(docs/adding-an-algorithm.md)."""
