"""The SLA loop: collectors, the policy and controllers, once a cycle."""
