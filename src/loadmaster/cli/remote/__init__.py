"""Commands that talk to a running API, one module per subject. Importing this package
registers them, in the order ``--help`` lists them."""

# isort: skip_file
from loadmaster.cli.remote import hosts  # noqa: F401
from loadmaster.cli.remote import vocabulary  # noqa: F401
from loadmaster.cli.remote import flavors  # noqa: F401
from loadmaster.cli.remote import images  # noqa: F401
from loadmaster.cli.remote import vms  # noqa: F401
from loadmaster.cli.remote import groups  # noqa: F401
from loadmaster.cli.remote import scheduling  # noqa: F401
