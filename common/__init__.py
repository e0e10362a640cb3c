"""The contract every backend implements: metadata types, validation, the device model,
the variant registry, the matrix loader, dispatch, and the torch reference of every op."""
