fn main() -> std::process::ExitCode {
    emon::cli::main()
}
