# This file is maintained automatically by "terraform init".
# Manual edits may be lost in future updates.

provider "registry.terraform.io/terraform-provider-openstack/openstack" {
  version     = "3.4.0"
  constraints = "3.4.0"
  hashes = [
    "h1:akg9kTeqO1mpkqdYACqNeabFIudXP0P/2LhBf6uJiLU=",
  ]
}
