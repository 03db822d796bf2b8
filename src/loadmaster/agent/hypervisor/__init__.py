"""The hypervisor drivers and what the agent needs from one."""
