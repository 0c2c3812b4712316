"""Optional integrations with other libraries (docs/design.md §11).

Nothing here is imported by `import sonicmoe`; each submodule needs its library:
sonicmoe.integrations.transformers needs Hugging Face transformers.
"""
