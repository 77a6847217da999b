"""Model architectures, their registry and weight loading. Kept import-light: the architecture
modules are imported by `architectures.get_model_class` when first needed."""
