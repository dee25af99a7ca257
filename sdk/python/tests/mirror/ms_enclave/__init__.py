"""A mirror of the interface ms-enclave documents for custom sandbox types
("Custom Sandbox": register_sandbox, SandboxType, SandboxStatus,
SandboxConfig, Sandbox with update_status/initialize_tools/execute_tool,
SandboxFactory, async with). ms-enclave cannot be installed on this
project's machines (no Python package index), so warren.enclave is tested
against this mirror; nothing here comes from ms-enclave's code."""
