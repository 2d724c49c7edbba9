output "nodes" {
  description = "Map of node name => {name, index, role, gpus}; index 0 is the master."
  value       = local.nodes
}

output "names" {
  description = "Node names, master first."
  value       = local.names
}
