fn main() {
    std::process::exit(agentfs::cli::main());
}
