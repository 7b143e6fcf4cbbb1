
#compdef oxrl

_oxrl_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _OXRL_COMPLETE=complete_zsh oxrl)
}

compdef _oxrl_completion oxrl

